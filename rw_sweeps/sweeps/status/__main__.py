"""`python -m rw_sweeps.sweeps.status`: the command (`cli.main`)."""
import sys

from .cli import main

sys.exit(main())
