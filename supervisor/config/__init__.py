"""The configuration: the attrs model, the checks, loading a TOML file and rendering it back."""
