"""`Decoder`: the state of one speculative generation and its round.
p = target, q = draft, k = γ.

A round: the drafter proposes a chain of k' <= k tokens (`Draft`) or a tree
of at most `budget` nodes (`TreeDraft`), with the rows q they were drawn
from; one target forward over [last token, drafts] gives p at every
position (a tree forward masks each node to its own path); the Rust
verifier keeps an accepted prefix or path plus one token; the target cache
is cut to the accepted length (a tree's: compacted to the accepted path),
and the new last token waits for the next round. A proposal may carry a
`Window` (lookahead's Jacobi window): its nodes run in the same forward
after the drafts, under one tree mask, are never verified or kept in the
cache, and their logits go back to the drafter (``observe_window``).

With a grammar (`structured.Constraint`) every round is constrained: where
the grammar forces the next tokens, they are the round's drafts (q one-hot;
the drafter does not propose that round); otherwise the drafter draws
through a `GrammarSampler` (its rows masked as it draws), its drafts are
walked by the grammar (a forced run after the last one follows it, q
one-hot), and a deterministic draft it refuses ends the
chain there (its rejection was certain, and its row gives the same token
either way); the target rows the verifier may read are masked; the grammar
then consumes what the round emitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models, runner
from specdec_rs._core import row_seed
from specdec_rs.drafters.base import Members
from specdec_rs.drafters.draft import (
    Draft,
    Flag,
    checked_draft,
    checked_tree,
    checked_window,
    joined,
)
from specdec_rs.generation.inputs import Prompt, shared_vocab
from specdec_rs.generation.result import GenerationResult
from specdec_rs.processors import Sampler, SamplingConfig, one_hot
from specdec_rs.rounds import Round, Stats
from specdec_rs.structured.constraint import FORCED_SOURCE, GrammarSampler, masked_logits
from specdec_rs.verify import verify, verify_gathered, verify_greedy, verify_tree

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from specdec_rs.drafters import Drafter
    from specdec_rs.generation.prefix import PrefixCache
    from specdec_rs.structured import Constraint, Walk


@dataclass(frozen=True)
class Pending:
    """A round between its proposal and its target forward (`Decoder.begin`).
    block: the chain's target input (1 + drafts,) on the target's device;
    None for a tree or a proposal with a window (their forward is
    `runner.forward_tree`). walk: the grammar's reading of the drafts
    (None without a grammar); forced_drafts: the chain's last drafts the
    grammar forced (all of a forced round's, else the walk's tail)."""

    asked: int
    tree: bool
    proposal: Any
    flags: list[Flag]
    block: torch.Tensor | None
    draft_s: float
    walk: Walk | None = None
    forced_drafts: int = 0


class Decoder:
    """The state of one speculative generation: the sequence (on the host),
    the target's cache (always all of seq but its last token), the drafter,
    the RNGs. Runs wherever the target's weights are.

    Draft tokens come from `sampler` (a torch.Generator on the target's
    device seeded with `seed`); round r's accept/residual draws come from the
    Rust stream row_seed(seed, r).

    How a chain round reaches the Rust verifier (`transfer`): on the CPU the
    rows are read in place (zero-copy); elsewhere ("gathered") p_i(x_i),
    q_i(x_i), the drafts and the deferred checks travel to the host in one
    copy, then only the row(s) the last token is drawn from.
    transfer="gathered" runs that path on the CPU too (tests).
    A round is `begin` (the proposal), `forward` (the target alone) and
    `finish` (verify, crop, the drafter's update); a batch runs many rows'
    forwards as one between their begins and finishes. prefill=False leaves
    the prompt out of the cache for the caller to run in pieces beside
    other rows' rounds (`prefill_piece`, then `prefilled_piece` after the
    forward); the first round waits until `prefill_left` is 0.
    Under a grammar a lone round's GGUF head computes only the panels of
    the ids its masks allow (`masked_head`; the same bits where read).
    """

    masked_head = True  # False: every round's head over the whole vocabulary (A/B, tests)

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: Drafter | None,
        input_ids: Any,
        config: SamplingConfig,
        seed: int,
        vocab_size: int | None = None,
        *,
        transfer: str = "auto",
        margins: bool = False,
        cache: Any = None,
        constraint: Constraint | None = None,
        prefill: bool = True,
        prefix: PrefixCache | None = None,
    ):
        import torch

        self.t_start = time.perf_counter()
        self.record_margins = margins
        self.margins: list[float] = []
        self.target, self.drafter, self.config, self.seed = target, drafter, config, seed
        self.constraint = constraint
        vocab = shared_vocab(target, drafter, vocab_size)
        self.vocab = vocab
        self.seq = Prompt.of(input_ids, vocab).ids  # checked once: a Prompt passes as it is
        self.prompt_length = len(self.seq)
        self.device = models.device_of(target)
        transfer = _checks.choice(transfer, "transfer", ("auto", "gathered"))
        self.gathered = transfer == "gathered" or self.device.type != "cpu"
        generator = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        self.sampler = Sampler(config, vocab, generator)
        self.stats = Stats()
        # an empty cache to reuse (a batch slot's), else a new one
        self.cache = runner.new_cache(target) if cache is None else cache
        self.members = Members.of(drafter)  # its optional members, found once
        self.wants_hidden = self.members.wants_hidden
        self.cached = 0  # prompt positions in the target cache (prompt_length - 1 once prefilled)
        self.prefix = prefix
        if prefix is not None:  # the prompt's longest stored prefix, unless its states are read
            prefix.bind(target)
            reusable = 0 if self.wants_hidden else self.prompt_length - 1
            self.cached = prefix.restore(self.seq, self.cache, reusable)
        self.cached_tokens = self.cached  # the prompt positions reused, not computed
        self._prefill_states: list[torch.Tensor] = []
        if not prefill:
            self._prefilled()  # a one-token prompt, or a prompt all reused: nothing to prefill
            return
        hidden = None
        if self.prompt_length - 1 > self.cached:
            _, hidden = runner.forward_with_hidden(
                target, self.seq[self.cached : -1], self.cache, keep=1, hidden=self.wants_hidden
            )
        self.cached = self.prompt_length - 1
        self._start_drafter(hidden)

    # ---- the prefill in pieces (a batch round's chunked prefill)
    @property
    def prefill_left(self) -> int:
        """Prompt positions still to enter the target cache (all but the
        prompt's last token are cached before the first round)."""
        return self.prompt_length - 1 - self.cached

    def prefill_piece(self, limit: int) -> torch.Tensor:
        """The next up to `limit` prompt tokens to run after the cache (one
        chunk of the prefill; its forward is the caller's: a batch round).
        With a prefix cache, the blocks it now holds past the cache come
        first (another row may have stored them since this one joined);
        when they end the prompt, the piece is empty and the drafter starts."""
        if self.prefix is not None and not self.wants_hidden and self.prefill_left > 0:
            gained = self.prefix.restore(self.seq, self.cache, self.prompt_length - 1, query=False)
            self.cached += gained
            self.cached_tokens += gained
            if gained and self.prefill_left == 0:
                self._prefilled()
        return self.seq[self.cached : min(self.cached + limit, self.prompt_length - 1)]

    def prefilled_piece(self, n: int, states: torch.Tensor | None) -> bool:
        """The forward ran the `n` tokens of `prefill_piece` after the cache
        (now grown by n); `states` (n, H): their last hidden states (when the
        drafter reads them). The prompt's blocks so far go to the prefix
        cache (rows prefilling the same prompt read them at their next
        piece). Starts the drafter once the prompt is in; True then."""
        self.cached += n
        if self.wants_hidden and states is not None:
            self._prefill_states.append(states)
        if self.prefix is not None and self.prefill_left > 0:
            self.prefix.store(self.seq, self.cache, self.cached)
        return self._prefilled()

    def _prefilled(self) -> bool:
        if self.prefill_left > 0:
            return False
        import torch

        parts, self._prefill_states = self._prefill_states, []
        hidden = torch.cat(parts) if parts and self.wants_hidden else None
        self._start_drafter(hidden)
        return True

    def _start_drafter(self, hidden: torch.Tensor | None) -> None:
        """The drafter's start on the prefilled prompt (stored in the prefix
        cache first); the prefill's time (with chunks, from the decoder's
        start to the prompt's last chunk)."""
        if self.prefix is not None:
            self.prefix.store(self.seq, self.cache, self.prompt_length - 1)
        if self.drafter is not None:
            self.drafter.start(self.seq, self.cache, hidden)
        self.stats.prefill = time.perf_counter() - self.t_start

    def remember(self) -> None:
        """Keep the sequence's keys and values in the prefix cache (at the
        generation's end; nothing without one). Cache position t holds seq[t]'s
        while t < len(seq) (positions past an EOS cut are not stored)."""
        if self.prefix is not None:
            self.prefix.store(self.seq, self.cache, len(self.seq))

    @property
    def generated(self) -> int:
        return len(self.seq) - self.prompt_length

    def step(self, k: int) -> Round:
        """One round with a chain of up to k drafts (k = 0, or no drafter: a
        plain target step through the same code). Its `emitted` tokens
        (1..k+1) go to append() next (or a prefix of them, at EOS)."""
        return self.round(k, tree=False)

    def round(self, asked: int, tree: bool, forced: int = 0) -> Round:
        """One whole round: `begin`, the target forward, `finish` (a chain of
        up to `asked` drafts, or a tree of at most `asked` nodes; up to
        `forced` grammar-forced tokens)."""
        pending = self.begin(asked, tree, forced)
        t1 = time.perf_counter()
        logits, hidden = self.forward(pending)
        return self.finish(pending, logits, hidden, time.perf_counter() - t1)

    def begin(self, asked: int, tree: bool, forced: int = 0) -> Pending:
        """A round's first half: the drafter's checked proposal (or up to
        `forced` tokens the grammar forces) and the target block to run
        ([last token, drafts] for a chain)."""
        import torch

        t0 = time.perf_counter()
        proposal, flags = self._propose(asked, tree, forced)
        walk, forced_drafts = None, 0
        if self.constraint is not None:
            if tree:
                raise ValueError("a grammar constrains chains only; drop tree= or the grammar")
            tail = 0 if proposal.window is not None else forced - len(proposal.tokens)
            proposal, walk = self._constrain(proposal, tail)
            if proposal.source == FORCED_SOURCE:
                asked = forced_drafts = len(proposal.tokens)
            else:
                asked += len(walk.tail)
                forced_drafts = len(walk.tail)
        block = None
        if proposal.parents is None and proposal.window is None:
            block = torch.cat([self.seq[-1:].to(self.device), proposal.tokens.to(self.device)])
        seconds = time.perf_counter() - t0
        return Pending(asked, tree, proposal, flags, block, seconds, walk, forced_drafts)

    def _constrain(self, proposal: Draft, tail: int) -> tuple[Draft, Walk]:
        """The grammar's walk along a chain's drafts, and the chain cut to
        the drafts worth running: none after an EOS; none after a refused
        draft; and not the refused draft itself when it is deterministic
        (q one-hot there: rejected with certainty, the round's last token is
        drawn from that row's masked p either way). When the grammar forces
        what follows the last draft, up to `tail` such tokens extend the
        chain, q one-hot: each is a function of the drafts before it, so
        its row is the law it was drawn from, and the chain stays exact."""
        import torch

        assert self.constraint is not None
        tokens = [int(t) for t in proposal.tokens.tolist()]
        walk = self.constraint.walk(tokens, max(0, tail))
        keep = walk.useful
        i = walk.refused
        if i is not None and float(proposal.q[i, tokens[i]]) == 1.0:
            keep = i
        if keep < len(tokens):
            proposal = replace(proposal, tokens=proposal.tokens[:keep], q=proposal.q[:keep])
        if walk.tail:
            extra = torch.tensor(walk.tail, dtype=proposal.tokens.dtype)
            q = one_hot(extra, proposal.q.shape[-1]).to(proposal.q)
            proposal = replace(
                proposal,
                tokens=torch.cat([proposal.tokens, extra.to(proposal.tokens.device)]),
                q=torch.cat([proposal.q, q]),
            )
        return proposal, walk

    def forward(self, pending: Pending) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target forward of a pending round, alone: logits (n, V) and
        (for drafters that read them) hidden states (n, H). A batch runs
        many rounds' blocks in one forward instead (`specdec_rs.engine`)."""
        proposal, walk = pending.proposal, pending.walk
        if pending.block is not None:
            return runner.forward_with_hidden(
                self.target,
                pending.block,
                self.cache,
                keep=len(pending.block),
                hidden=self.wants_hidden,
                allowed=walk.allowed if walk is not None and self.masked_head else None,
            )
        tokens = proposal.tokens.to(self.device)
        parents = proposal.parents
        if parents is None:  # a chain with a window: the chain as a tree
            parents = list(range(-1, len(tokens) - 1))
        rows = None
        if proposal.window is not None:  # after the drafts, under the root or each other
            tokens, parents, rows = joined(tokens, parents, proposal.window)
        return runner.forward_tree(
            self.target,
            self.seq[-1:],
            tokens,
            parents,
            self.cache,
            hidden=self.wants_hidden,
            rows=rows,
        )

    def finish(
        self,
        pending: Pending,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        target_s: float,
    ) -> Round:
        """A round's second half, after its target forward: verify, cut the
        cache to the accepted length, update the drafter; the `Round`."""
        import torch

        seq, sampler, drafter = self.seq, self.sampler, self.drafter
        proposal, flags, asked, tree = pending.proposal, pending.flags, pending.asked, pending.tree
        tokens, parents = proposal.tokens, proposal.parents
        t2 = time.perf_counter()
        window, window_logits = proposal.window, None
        window_nodes = 0 if window is None else len(window.tokens)
        if window is not None:  # the window's rows go to the drafter, never to the verifier
            main = len(tokens) + 1
            window_logits = logits[main:]
            logits = logits[:main]
            hidden = None if hidden is None else hidden[:main]
        walk = pending.walk
        if walk is not None:  # the constrained target
            logits = masked_logits(logits, walk.allowed, self.vocab)
        p = p_argmax = None
        if self.greedy_chain(proposal):  # one-hot rows: their argmaxes suffice
            p_argmax = sampler.greedy_tokens(logits, name="the target's logits")
            q = proposal.q if proposal.q is not None else logits[:0, : self.vocab]
            emitted = tuple(int(t) for t in verify_greedy(p_argmax, q, proposal.tokens))
            kept = list(range(len(emitted) - 1))
        else:
            p = sampler.probs(logits, name="the target's logits")
            seed = row_seed(self.seed, self.stats.rounds)
            emitted, kept = self._verify(p, proposal, flags, seed)
        if walk is not None:
            assert self.constraint is not None
            self.constraint.settle(walk, emitted)
        margins = None
        if self.record_margins:  # the rows the emitted tokens were chosen from
            chosen = range(len(emitted)) if parents is None else [0, *(i + 1 for i in kept)]
            margins = logit_margins(logits[list(chosen), : self.vocab])
        n = len(seq)  # the cache held n - 1 entries; the forward added 1 + len(tokens)
        if parents is None:
            runner.crop(self.cache, n + len(kept))
        else:
            keep = [*range(n), *(n + i for i in kept)]
            runner.keep_positions(self.cache, torch.tensor(keep))
        if window_logits is not None:
            observe = self.members.observe_window
            if observe is None:
                raise ValueError(
                    f"drafter {getattr(drafter, 'name', drafter)!r} proposed a window but has "
                    "no observe_window(logits) to read its rows; give it one or drop the window"
                )
            observe(window_logits)
        if drafter is not None:
            rows = hidden
            if hidden is not None:
                rows = (
                    hidden[: len(kept) + 1]
                    if parents is None
                    else hidden[[0, *(i + 1 for i in kept)]]
                )
            drafter.update(seq, len(kept), rows)
        t3 = time.perf_counter()
        r = Round(
            index=self.stats.rounds,
            asked=asked,
            drafted=len(tokens),
            depth=len(tokens) if parents is None else proposal.depth,
            accepted=len(kept),
            emitted=emitted,
            source=getattr(proposal, "source", None),
            tree=tree,
            draft_s=pending.draft_s,
            target_s=target_s,
            verify_s=t3 - t2,
            positions=len(tokens) + 1 + window_nodes,
            window=window_nodes,
            p=p,
            q=proposal.q,
            tokens=tokens,
            p_argmax=p_argmax,
            margins=margins,
            forced_drafts=pending.forced_drafts,
        )
        self.stats.add(r)
        return r

    def _propose(self, asked: int, tree: bool, forced: int = 0) -> tuple[Any, list[Flag]]:
        """The drafter's checked proposal (an empty chain without a drafter or
        with k = 0), or the grammar's forced run (with a drafter), and the
        value checks deferred to the verifier's copy."""
        import torch

        drafter = self.drafter
        if self.constraint is not None and drafter is not None and not tree:
            run = self.constraint.forced(forced)
            if run:
                tokens = torch.tensor(run, dtype=torch.long, device=self.device)
                return Draft(tokens, one_hot(tokens, self.vocab), FORCED_SOURCE), []
        if tree:
            assert drafter is not None
            propose_tree = self.members.propose_tree
            assert propose_tree is not None  # checked with the tree budget (check_tree_drafter)
            draft = propose_tree(self.seq, asked, self.sampler)
            return checked_tree(draft, asked, self.vocab, drafter.name), []
        if drafter is None or asked == 0:
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            return Draft(empty, None), []  # type: ignore[arg-type]
        if self.constraint is None:
            draft = drafter.propose(self.seq, asked, self.sampler)
        else:  # the drafter's own rows masked as it draws (`GrammarSampler`)
            masked = GrammarSampler(self.sampler, self.constraint)
            try:
                draft = drafter.propose(self.seq, asked, masked)
            finally:
                masked.undo()
        tokens, q, flags = checked_draft(
            draft, asked, self.vocab, drafter.name, eager=not self.gathered
        )
        window = checked_window(getattr(draft, "window", None), self.vocab, drafter.name)
        return Draft(tokens, q, getattr(draft, "source", None), window), flags

    def greedy_chain(self, proposal: Any) -> bool:
        """Whether the round verifies by the target's argmaxes alone
        (`verify_greedy`): a greedy target, a chain, checks that raise at once (CPU)."""
        return self.sampler.config.greedy and proposal.parents is None and not self.gathered

    def _verify(
        self, p: torch.Tensor, proposal: Any, flags: list[Flag], seed: int
    ) -> tuple[tuple[int, ...], list[int]]:
        """(emitted tokens, indices of the drafts kept) of the round's verification."""
        parents = proposal.parents
        if parents is not None:
            for flag, what in self.sampler.take_flags():
                if bool(flag):
                    raise ValueError(what)
            q = None if proposal.q is None else proposal.q.cpu()
            out, nodes = verify_tree(
                p.cpu(), q, proposal.tokens.cpu(), parents, seed, children=proposal.children
            )
            return tuple(int(t) for t in out), [int(i) for i in nodes]
        q = proposal.q if proposal.q is not None else p[:0]
        if self.gathered:
            out = verify_gathered(p, q, proposal.tokens, seed, flags + self.sampler.take_flags())
        else:
            out = verify(p, q, proposal.tokens, seed)
        emitted = tuple(int(t) for t in out)
        return emitted, list(range(len(emitted) - 1))

    def append(
        self, tokens: list[int] | tuple[int, ...], margins: tuple[float, ...] | None = None
    ) -> None:
        """Commit `tokens` (a round's emitted tokens or a prefix of them) and,
        when margins are recorded, theirs."""
        import torch

        self.seq = torch.cat([self.seq, torch.tensor(tokens, dtype=torch.long)])
        if margins is not None:
            self.margins += margins[: len(tokens)]

    def result(self, stop: str, policy: str, k: int | None, tree: bool) -> GenerationResult:
        """k: the k to report (None: the most any round used)."""
        s = self.stats
        return GenerationResult(
            tokens=[int(t) for t in self.seq[self.prompt_length :]],
            prompt_length=self.prompt_length,
            drafter=self.drafter.name if self.drafter is not None else "none",
            k=max(s.k_per_round, default=0) if k is None else k,
            policy=policy,
            tree=tree,
            temperature=self.config.temperature,
            seed=self.seed,
            stop_reason=stop,
            rounds=s.tally.rounds,
            drafted=s.tally.drafted,
            accepted_histogram=list(s.tally.histogram),
            reached=list(s.tally.reached),
            accepted=list(s.tally.accepted),
            time_prefill=s.prefill,
            time_draft=s.draft,
            time_target=s.target,
            time_verify=s.verify,
            time_total=time.perf_counter() - self.t_start,
            k_per_round=s.k_per_round,
            kept_per_round=s.kept_per_round,
            margins=self.margins,
            forced=s.forced,
            forced_accepted=s.forced_accepted,
            grammar_accepting=None if self.constraint is None else self.constraint.accepting,
            cached_tokens=self.cached_tokens,
            drafting=s.tally.drafting,
        )


def logit_margins(logits: torch.Tensor) -> tuple[float, ...]:
    """Per row of (n, V) logits: the largest minus the second largest (0 at a tie)."""
    import torch

    rows = logits.float()
    top = rows.max(-1)
    rest = rows.scatter(-1, top.indices[:, None], -torch.inf).amax(-1)
    return tuple(float(x) for x in top.values - rest)
