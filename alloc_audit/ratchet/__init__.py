"""The ratchet: the allowlist format, its keys, check against a scan, the gate between
two allowlists, and the scan-to-scan diff."""
