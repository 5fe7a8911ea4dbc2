"""The hop path: a stage's data sent to a worker group and its reply read back (one reply
stream and one reader per process), a stage sent on from group to group, and the blocking
read that rides in the pipeline of the writes it waits for."""
