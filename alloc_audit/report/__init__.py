"""Stage 8, report: a ScanResult -> text in one format. One module per
format; renderers return strings and never print (only cli.py prints)."""
