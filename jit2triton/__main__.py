"""`python -m jit2triton ...`: the CLI, for environments whose `jit2triton` script is not on the PATH."""
from .cli import main

main()
