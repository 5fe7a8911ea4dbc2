"""Experiments: copies of parts of the hop path with one change each, to measure what a
change to the real module would gain. Nothing here is imported by hookbus itself."""
