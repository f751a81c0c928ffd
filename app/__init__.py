"""The lvrl command line: LightningCLI subcommands (fit, validate, ...) plus data and model tools."""
