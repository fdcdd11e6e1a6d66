"""`sapo inspect`: read, follow and summarize sapo topics decoded (`decode`: record -> entry; `query`:
filters; `reader`: manual assignment, start modes, end by idleness; `render`: table, JSON lines,
summary; `cli`: the subcommand)."""
