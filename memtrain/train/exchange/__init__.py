"""The exchange area's shared files (in /dev/shm while a run lasts): every kind of file in it, with its lifetime
and its remover, and the area made and removed (area.py, their one owner); the board the participants meet at and the
round records (marks.py), sleeping on it until a mark lands (doorbell.py), the weight versions published,
retired and recycled under the one keep rule (weights.py). Read and written by both processes."""
