"""The `streamer` command line: thin typer commands over library functions."""
