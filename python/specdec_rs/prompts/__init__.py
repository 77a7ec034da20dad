"""The prompts, in one home low in the house (it imports nothing of the
package but its checks):

- `workloads`: the built-in evaluation workloads (code editing, open chat),
  held out, and `encode` (a message or conversation in the chat template).
- `training`: the built-in training prompts (disjoint from the evaluation
  ones, checked), and your own prompts files (`.jsonl`).
"""
