"""Commands: each takes frozen inputs and returns an outcome value; only
``cli.py`` prints and picks the exit code (STYLE.md section 1)."""
