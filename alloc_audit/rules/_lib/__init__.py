"""Analyses shared by several rules (taint, regions, throwaway captures, finding helpers).
Rules import these, never each other."""
