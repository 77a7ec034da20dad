"""Upper bounds on the counts the project takes, from the CLI, the API and
its own files: one table, so each bound is stated once (and in `--help`).
Each is far above any real use and low enough that a typo fails at once
instead of running for hours or allocating terabytes. No imports: the CLI,
the training configs and the file readers all read it."""

MAX_NEW_TOKENS = 1 << 20  # tokens one generation may add
MAX_PROMPTS = 10**6  # training prompts
MAX_TOKENS = 32_768  # one training prompt, answer or sequence
MAX_BATCH = 4_096  # sequences in one training or data batch
MAX_EPOCHS = 10_000.0
MAX_LR = 10.0
MAX_MEDUSA_HEADS = 16
MAX_LAYER_SIZE = 1 << 20  # any size in a head's layer shape, and a draft vocabulary
MAX_TOP_K = 1 << 31  # top-k filtering (any larger k keeps every token of any real vocabulary)
