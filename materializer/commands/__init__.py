"""The ``materializer`` subcommands that operate maps; ``materializer.cli`` registers them."""
