"""The loops an update runs through, and what they share: the round (rounds.py; a cluster's: sliced.py, stream.py),
async mode's desk (desk.py), the server's whole-vector steps (overlap.py), an additive model's pass (additive.py);
a task's gradient (gradient.py), the mapped run files and the one whole-vector step (mapped.py), the reduction
(reduce.py), maps kept between tasks (maps.py), the server's task threads (threads.py); the two-level cluster round:
the server's side (node_round.py), the partial sums (node_sum.py) and a node's compute (node_compute.py).

Runs in both processes: in workers, and in the server when it runs the rounds itself (train.workers = 0).
overlap.py is the server's own loop (it runs in the server only); desk.py and additive.py hold both sides."""
