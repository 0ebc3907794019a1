"""`python -m edgekit`: the same CLI as the `edgekit` command."""

from edgekit.cli import main

main(prog_name="edgekit")
