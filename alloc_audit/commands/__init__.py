"""The commands: one module per command, each returning an outcome value the CLI renders."""
