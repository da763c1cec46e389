"""`hubserve serve` on the command line: the flags (parser.py, flags.py) and what they become (serve.py)."""
