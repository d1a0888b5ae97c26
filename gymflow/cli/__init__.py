"""The `gymflow` command line. Subcommands are thin: they start or query workflows and read the DB."""
