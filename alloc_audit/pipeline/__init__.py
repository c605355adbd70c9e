"""The scan pipeline, one module or package per stage (run.py runs them in order):
discover -> prefilter -> parse -> extract -> expand -> index -> derive + classify -> suppress."""
