"""`BatchEngine`: many sequences per target pass, ragged acceptance,
continuous batching. p = target, q = draft, k = γ.

The engine holds up to `max_batch` rows (`scheduler.Scheduler`). Each row
is one request with its own drafter (from `drafter_factory`), sampling
settings, seed, budget and stop ids, and its own cache: a row is a
`Decoder` and its loop state (`loop.Run`), the same objects `generate`
runs, so a row's rounds are the rounds it would run alone. A batch round
(`step`):

1. every row proposes its drafts (k_i may differ, and may be 0; a
   load-aware policy such as `Goodput` chooses each k_i of the rows that
   did not fix their own);
2. one target forward runs every row's block [last token, drafts] after
   that row's cache (`runner.batch`: the weight products over all
   rows at once, attention per row over its own cache, causal within each
   block at that row's positions; on a GGUF target by the Rust layer, on a
   transformers Llama by its own modules, other models row by row);
3. each row verifies its own block (its own Rust stream row_seed(seed,
   round)), crops its own cache to its own accepted length, and commits its
   tokens (budget, EOS); `on_commit(id, Round, tokens)` hears each.

Rows finish independently; queued requests join between rounds
(continuous batching) into the freed slots, whose cache buffers they reuse.
A joining request's prompt is prefilled in chunks inside the rounds (on a
GGUF target): each round's forward carries, beside the running rows'
blocks, at most `prefill_chunk` prompt tokens of the rows still
prefilling (each piece after its row's cache; their logits are not
computed), so a join no longer stalls the batch and several prompts
prefill in one round. Which rows take the round's prompt tokens is
`prefill_order`: by default the fewest prompt tokens left first, aged by
how long each has waited (`scheduler.prefill_rank`), else the oldest.
A row's values depend neither on the chunking, nor on the order, nor on
the rows beside it (the kernels' fixed order), so its output is the same
bits as alone. prefill_chunk=0, and targets of other
paths, prefill each request alone when it joins.

With a `PrefixCache` (GGUF targets), a joining row first copies the
longest stored prefix of its prompt into its cache and prefills only the
rest; a row's prompt is stored when it is prefilled, and its whole
sequence when it finishes or is cancelled, for the requests after it.
A row whose drafter fails its checks, or whose request cannot start, ends
with its error alone; the other rows go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models
from specdec_rs.engine.requests import (
    Admission,
    Checked,
    Factory,
    Finished,
    Request,
    named_factories,
)
from specdec_rs.engine.scheduler import (
    PREFILL_ORDER,
    PREFILL_ORDERS,
    Row,
    Scheduler,
    default_cache_positions,
    prefill_rank,
)
from specdec_rs.generation.decoder import Decoder, Pending
from specdec_rs.generation.inputs import check_drafter, shared_vocab
from specdec_rs.generation.loop import Run
from specdec_rs.generation.prefix import checked_prefix
from specdec_rs.generation.result import GenerationResult
from specdec_rs.policy import FixedK
from specdec_rs.policy.base import MAX_K
from specdec_rs.policy.goodput import BatchRow, Goodput
from specdec_rs.runner import backend_of
from specdec_rs.runner.stack import CHUNK
from specdec_rs.structured.constraint import GrammarDeadEnd

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PreTrainedModel

    from specdec_rs.drafters import Drafter
    from specdec_rs.generation.prefix import PrefixCache
    from specdec_rs.policy.goodput import ForwardProfile
    from specdec_rs.rounds import Round

MAX_ROWS = 1024  # the most rows one engine may hold
PREFILL_CHUNK = 64  # prompt tokens a batch round prefills beside its running rows (by default)
MAX_PREFILL_CHUNK = 1 << 20


@dataclass(frozen=True)
class BatchStep:
    """One batch round: rows in it (decoding rows; the rows prefilling
    beside them are counted in `prefill`, their tokens), the γ the batch
    policy gave each row it chose for (`ks`, in row order; None without a
    policy), tokens emitted, seconds (wall, and in the one target forward),
    and the policy's predicted tokens per second (None without)."""

    rows: int
    ks: tuple[int, ...] | None
    tokens: int
    seconds: float
    target_s: float
    predicted_goodput: float | None
    prefill: int = 0  # prompt tokens prefilled in the round's forward


@dataclass(frozen=True)
class BatchResult:
    """Per request (in the order given) its `Finished`, and the rounds."""

    rows: list[Finished]
    steps: list[BatchStep] = field(repr=False)
    time_total: float = 0.0

    @property
    def results(self) -> list[GenerationResult | None]:
        return [f.result for f in self.rows]

    @property
    def new_tokens(self) -> int:
        return sum(len(f.result.tokens) for f in self.rows if f.result is not None)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    @property
    def measured_goodput(self) -> float:
        """Tokens per second over the batch rounds (prefills not counted)."""
        seconds = sum(s.seconds for s in self.steps)
        return sum(s.tokens for s in self.steps) / seconds if seconds > 0 else 0.0

    @property
    def predicted_goodput(self) -> float | None:
        """The policy's predicted tokens per second over the same rounds
        (each round weighted by its measured seconds), None without a policy."""
        timed = [(s.predicted_goodput, s.seconds) for s in self.steps]
        pairs = [(g, t) for g, t in timed if g is not None]
        seconds = sum(t for _, t in pairs)
        if not pairs or seconds <= 0:
            return None
        return sum(g * t for g, t in pairs) / seconds


OnCommit = Callable[[int, "Round", list[int]], None]  # (request id, its round, its new tokens)


class BatchEngine:
    """Up to `max_batch` sequences decoded together (see the module docs).

    drafter_factory: called once per admitted request for its own drafter
    (e.g. `sd.PromptLookup`, or ``lambda: sd.EarlyExit(target, 8)``); None
    for target-only rows. k: γ of the rows that set none; `goodput`, when
    given, chooses each row's k every round instead, from the load. Rows
    keep their caches' buffers from slot to slot.
    cache_positions: the most positions the rows' target caches may hold
    together (default: what half of this machine's memory holds,
    `default_cache_positions`); a request reserves its prompt plus its
    budget, and waits in the queue until that fits beside the running rows.
    drafters: more drafter factories by name, which a `Request` may pick
    (its `drafter`); "none" (target only) is always there.
    on_commit(id, round, tokens): called after each row's round with the
    tokens that round added to it (a server streams them from here).
    tokenizer: the target's (a transformers fast tokenizer), needed by
    requests with a grammar; each such row has its own grammar state.
    prefill_chunk: the most prompt tokens a round prefills beside the
    running rows (default `PREFILL_CHUNK`; 0: a joining request prefills
    alone as it joins). Only a GGUF target prefills in chunks (`chunked`).
    prefix_cache: a `generation.PrefixCache` the rows read prompts' prefixes
    from and store their sequences in (a GGUF target's; None: none).
    prefill_order: which rows still prefilling take a round's prompt
    tokens first: "shortest" (default; the fewest tokens left, aged by the
    wait, `scheduler.prefill_rank`) or "fifo" (the oldest request). Rows'
    outputs do not depend on it.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter_factory: Callable[[], Drafter] | None,
        *,
        max_batch: int = 8,
        k: int = 4,
        goodput: Goodput | None = None,
        vocab_size: int | None = None,
        transfer: str = "auto",
        allow_past_context: bool = False,
        cache_positions: int | None = None,
        drafters: Mapping[str, Callable[[], Drafter] | None] | None = None,
        on_commit: OnCommit | None = None,
        tokenizer: Any = None,
        prefill_chunk: int | None = None,
        prefix_cache: PrefixCache | None = None,
        prefill_order: str = PREFILL_ORDER,
    ):
        models.check_model(target, "target")
        if drafter_factory is not None:
            _checks.function(drafter_factory, "drafter_factory")
        self.target = target
        self.on_commit = None if on_commit is None else _checks.function(on_commit, "on_commit")
        self.max_batch = _checks.integer(max_batch, "max_batch", minimum=1, maximum=MAX_ROWS)
        self.k = _checks.integer(k, "k", minimum=0, maximum=MAX_K)
        self.goodput: Goodput | None = None
        self.vocab_size = vocab_size
        self.transfer = _checks.choice(transfer, "transfer", ("auto", "gathered"))
        self.vocab = shared_vocab(target, None, vocab_size)
        cache_positions = (
            default_cache_positions(target)
            if cache_positions is None
            else _checks.integer(cache_positions, "cache_positions", minimum=1)
        )
        self.admission = Admission(
            target,
            self.vocab,
            drafter_factory,
            named_factories(drafters),
            tokenizer,
            _checks.boolean(allow_past_context, "allow_past_context"),
            cache_positions,
        )
        self.backend = backend_of(target)  # how a round's rows share one forward
        self.prefill_chunk = (
            PREFILL_CHUNK
            if prefill_chunk is None
            else _checks.integer(
                prefill_chunk, "prefill_chunk", minimum=0, maximum=MAX_PREFILL_CHUNK
            )
        )
        self.prefill_order = _checks.choice(prefill_order, "prefill_order", PREFILL_ORDERS)
        # the prefill in the rounds only where a row's bits cannot depend on it
        self.chunked = self.prefill_chunk > 0 and self.backend.name == "gguf"
        self.prefix = checked_prefix(prefix_cache, target)
        self.scheduler = Scheduler(self.max_batch, cache_positions)
        self.finished: list[Finished] = []
        self.steps: list[BatchStep] | None = None  # the rounds of a `run()`, while one runs
        self.next_id = 0
        self.use_goodput(goodput)

    # ---- what requests are checked against
    @property
    def factory(self) -> Factory | None:
        """The drafter factory of requests that name none."""
        return self.admission.default

    @factory.setter
    def factory(self, factory: Factory | None) -> None:
        self.admission = replace(self.admission, default=factory)

    @property
    def drafters(self) -> Mapping[str, Factory | None]:
        """The drafter factories a request may name ("none" among them)."""
        return self.admission.drafters

    @property
    def tokenizer(self) -> Any:
        return self.admission.tokenizer

    @property
    def cache_positions(self) -> int:
        return self.admission.cache_positions

    @property
    def path(self) -> str:
        """The name of the backend a round's rows share one forward by ("gguf", "llama", "rows")."""
        return self.backend.name

    def use_goodput(self, goodput: Goodput | None) -> None:
        """Choose γ by `goodput` from now on (None: the fixed k); it starts
        here, with its forward profile measured on this engine (or cached)
        unless it was given one."""
        if goodput is not None and not isinstance(goodput, Goodput):
            raise ValueError(
                f"goodput is a {type(goodput).__name__}; pass a policy.Goodput or None "
                "(a fixed γ is k=...)"
            )
        self.goodput = goodput
        if goodput is not None:
            profile = goodput.profile
            if profile is None:
                profile = self.profile(ks=goodput.profiled_positions())
            goodput.start(profile)
            for row in self.live_rows():
                goodput.join(row.id)

    # ---- requests
    def submit(self, request: Request) -> int:
        """Queue a request (checked now: a bad one is a ValueError naming its
        id, and nothing is queued); returns its id."""
        item = self.check(request, self.next_id)
        self.next_id += 1
        self.scheduler.queue.append(item)
        return item.id

    def check(self, request: Request, rid: int, where: str | None = None) -> Checked:
        """`request` checked and converted as it would be queued with id
        `rid` (ValueError naming `where`, default "request <rid>")."""
        return self.admission.check(request, rid, where)

    def cancel(self, rid: int) -> bool:
        """Drop request `rid` (queued or running; its slot is freed now).
        False when it is not here (finished, or never submitted)."""
        if self.scheduler.dequeue(rid):
            return True
        slot = self.scheduler.slot_of(rid)
        if slot is None:
            return False
        self._free(slot)
        return True

    @property
    def rows(self) -> list[Row | None]:
        """The slots: each running row, or None."""
        return self.scheduler.rows

    @property
    def active(self) -> int:
        """Rows decoding now."""
        return self.scheduler.active

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    @property
    def reserved(self) -> int:
        """Cache positions the running rows may fill (prompt + budget each)."""
        return self.scheduler.reserved

    def live_rows(self) -> list[Row]:
        return self.scheduler.live()

    # ---- rounds
    def step(self) -> list[Finished]:
        """Admit queued requests into free slots, run one batch round over
        the rows, and return the requests that finished (or failed) in it."""
        import torch

        with torch.inference_mode():
            for item, error in self.scheduler.admit(self._start):
                self.finished.append(Finished(item.id, None, str(error)))
            if self.active:
                self._round()
        out, self.finished = self.finished, []
        return out

    def run(self, requests: Iterable[Request]) -> BatchResult:
        """Submit every request, step until all are done; the outcomes in
        submission order."""
        started = time.perf_counter()
        ids = [self.submit(r) for r in requests]
        done: dict[int, Finished] = {}
        steps: list[BatchStep] = []
        self.steps = steps  # recorded for this run only (a server's engine keeps none)
        try:
            while self.queued or self.active:
                for f in self.step():
                    done[f.id] = f
        finally:
            self.steps = None
        return BatchResult([done[i] for i in ids], steps, time.perf_counter() - started)

    def _start(self, item: Checked) -> Row:
        drafter = None if item.factory is None else item.factory()
        check_drafter(drafter, self.target)
        decoder = Decoder(
            self.target,
            drafter,
            item.prompt,
            item.config,
            item.seed,
            self.vocab_size,
            transfer=self.transfer,
            cache=self.scheduler.reused_cache(),
            constraint=item.constraint,
            prefill=not self.chunked,
            prefix=self.prefix,
        )
        # the row's own γ, else the engine's (a batch policy overrides it each
        # round); a row without a drafter asks for none
        fixed = item.k if item.k is not None else 0 if drafter is None else None
        policy = FixedK(fixed if fixed is not None else self.k)
        run = Run(decoder, policy, None, None, item.max_new, item.eos)
        if self.goodput is not None and fixed is None:
            self.goodput.join(item.id)
        return Row(item.id, decoder, run, fixed)

    def _free(self, slot: int, remember: bool = True) -> None:
        """Free a slot (its sequence kept in the prefix cache, unless it failed)."""
        row = self.rows[slot]
        assert row is not None
        if remember:
            row.decoder.remember()
        self.scheduler.release(slot)
        if self.goodput is not None:
            self.goodput.leave(row.id)

    def _fail(self, slot: int, error: Exception) -> None:
        row = self.rows[slot]
        assert row is not None
        self._free(slot, remember=False)
        refused = isinstance(error, GrammarDeadEnd)
        self.finished.append(Finished(row.id, None, f"request {row.id}: {error}", refused))

    def _round(self) -> None:
        started = time.perf_counter()
        live = [(slot, row) for slot, row in enumerate(self.rows) if row is not None]
        ready = [(slot, row) for slot, row in live if row.decoder.prefill_left == 0]
        pieces = self._prefill_pieces(
            [(s, r) for s, r in live if r.decoder.prefill_left > 0], ready
        )
        choice = None
        if self.goodput is not None and ready:
            choice = self.goodput.choose(
                [BatchRow(r.id, len(r.decoder.seq)) for _, r in ready if r.fixed_k is None]
            )
        pending: list[tuple[int, Row, Pending]] = []
        for slot, row in ready:
            k = (
                row.fixed_k
                if row.fixed_k is not None
                else choice.ks[row.id]
                if choice is not None
                else self.k
            )
            try:
                asked, tree = row.run.ask(k)
                pending.append((slot, row, row.decoder.begin(asked, tree, row.run.forced_limit)))
            except ValueError as e:
                self._fail(slot, e)
        if not pending and not pieces:
            return
        t1 = time.perf_counter()
        outputs = self.forward(
            [(row.decoder, p) for _, row, p in pending],
            [(row.decoder, piece) for _, row, piece in pieces],
        )
        target_s = time.perf_counter() - t1
        prefilled = sum(len(piece) for _, _, piece in pieces)
        for (slot, row, piece), (_, states) in zip(pieces, outputs[len(pending) :], strict=True):
            try:
                row.decoder.prefilled_piece(len(piece), states)
            except ValueError as e:  # the drafter's start refused the prompt
                self._fail(slot, e)
        outputs = outputs[: len(pending)]
        tokens, rounds = 0, []
        for (slot, row, p), (logits, hidden) in zip(pending, outputs, strict=True):
            try:
                r = self._settle(row, p, logits, hidden, target_s)
            except ValueError as e:
                self._fail(slot, e)
                continue
            before = row.decoder.generated
            row.run.commit(r)
            added = row.decoder.generated - before
            tokens += added
            rounds.append((row.id, r))
            if self.on_commit is not None:
                seq = row.decoder.seq
                self.on_commit(row.id, r, seq[len(seq) - added :].tolist() if added else [])
            if row.run.done:
                self._free(slot)
                self.finished.append(Finished(row.id, row.run.result()))
        seconds = time.perf_counter() - started
        if self.goodput is not None and pending:
            # every row ran the choice's drafts (a grammar's forced drafts were not its choice)
            uniform = all(row.fixed_k is None for _, row, _ in pending) and not any(
                r.forced_drafts for _, r in rounds
            )
            timed = not prefilled  # a round carrying prefill says nothing of a round's cost
            self.goodput.observe(
                rounds,
                len(pending),
                target_s if timed else 0.0,
                choice=choice if uniform else None,
                tokens=tokens,
                seconds=seconds if timed else 0.0,
            )
        if self.steps is not None:
            ks = None
            if choice is not None:
                ks = tuple(choice.ks[row.id] for _, row, _ in pending if row.id in choice.ks)
            predicted = None if choice is None else choice.predicted
            self.steps.append(
                BatchStep(len(pending), ks, tokens, seconds, target_s, predicted, prefilled)
            )

    def _prefill_pieces(
        self, prefilling: list[tuple[int, Row]], ready: list[tuple[int, Row]]
    ) -> list[tuple[int, Row, torch.Tensor]]:
        """(slot, row, the prompt tokens it prefills this round) of the rows
        still prefilling, in `prefill_order` (`scheduler.prefill_rank`), at
        most `prefill_chunk` tokens in all (a whole `CHUNK` when no row
        decodes: nobody waits), each piece at most `CHUNK` (the Rust
        forward's block). Each row left waiting counts the tokens others took."""
        budget = self.prefill_chunk if ready else max(self.prefill_chunk, CHUNK)
        order = sorted(
            prefilling,
            key=lambda sr: prefill_rank(
                self.prefill_order, sr[1].id, sr[1].decoder.prefill_left, sr[1].waited
            ),
        )
        pieces = []
        for slot, row in order:
            if budget <= 0:
                break
            try:
                piece = row.decoder.prefill_piece(min(budget, CHUNK))
            except ValueError as e:  # the prompt came whole from the prefix cache; start refused
                self._fail(slot, e)
                continue
            if len(piece):  # empty: the prefix cache gave the rest of the prompt
                pieces.append((slot, row, piece))
                budget -= len(piece)
        given = sum(len(piece) for _, _, piece in pieces)
        took = {row.id: len(piece) for _, row, piece in pieces}
        for _, row in prefilling:
            row.waited += given - took.get(row.id, 0)
        return pieces

    def _settle(
        self, row: Row, pending: Pending, logits: Any, hidden: Any, target_s: float
    ) -> Round:
        """A row's round after the batch forward (`Decoder.finish`: verify,
        crop its own cache, update its drafter)."""
        return row.decoder.finish(pending, logits, hidden, target_s)

    def forward(
        self,
        work: Sequence[tuple[Decoder, Pending]],
        pieces: Sequence[tuple[Decoder, torch.Tensor]] = (),
    ) -> list[tuple[Any, torch.Tensor | None]]:
        """The target forward of every pending round, and of the prefill
        pieces beside them: (logits, hidden) per round, then (None, hidden)
        per piece (hidden when its decoder's drafter reads it). The chains
        and the pieces run together (`forward_blocks`); a tree runs alone."""
        out: list[Any] = [None] * (len(work) + len(pieces))
        chains = [i for i, (_, p) in enumerate(work) if p.block is not None]
        if chains or pieces:
            decoders = [work[i][0] for i in chains] + [d for d, _ in pieces]
            blocks = [work[i][1].block for i in chains] + [t for _, t in pieces]  # no None
            walks = [(work[i][0], work[i][1].walk) for i in chains]
            logits, states = self.forward_blocks(
                blocks,  # type: ignore[arg-type]
                [d.cache for d in decoders],
                hidden=any(d.wants_hidden for d in decoders),
                read=len(chains),
                allowed=[w.allowed if w is not None and d.masked_head else None for d, w in walks]
                + [None] * len(pieces),
            )
            places = chains + list(range(len(work), len(work) + len(pieces)))
            for j, (i, d) in enumerate(zip(places, decoders, strict=True)):
                row_states = states[j] if d.wants_hidden and states is not None else None
                out[i] = (logits[j] if j < len(chains) else None, row_states)
        for i, (decoder, p) in enumerate(work):
            if out[i] is None:
                out[i] = decoder.forward(p)
        return out

    def forward_blocks(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        hidden: bool,
        read: int | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """blocks[s] (n_s,) after caches[s], each cache grown by n_s: logits
        (n_s, V) of the first `read` blocks (default all; the rest's are not
        computed where the path can skip them) and (when `hidden`) hidden
        states (n_s, H) of every block, in one forward over all rows
        (`runner.batch`, by `self.backend`; `allowed`: a grammar's masks of
        each block, see `Backend.forward_blocks`)."""
        return self.backend.forward_blocks(
            blocks, caches, hidden=hidden, read=read, allowed=allowed
        )

    def profile(self, ks: Iterable[int], **options: Any) -> ForwardProfile:
        """T(B, n) of this engine's forward for n in `ks` (`profile.profile_forward`)."""
        from specdec_rs.engine.profile import profile_forward

        return profile_forward(self, ks, **options)
