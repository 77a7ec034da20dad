"""`python -m specdec_rs` is the `specdec` command."""

import sys

from specdec_rs.cli import main

sys.exit(main())
