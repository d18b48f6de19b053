"""Training: a job -> versioned weight files, through rounds that worker processes (or the server) run.

Which process runs which module:

    server process                          worker process (one per slot; spawned)
    --------------                          ---------------------------------------
    command.py     the `memtrain train` CLI
    server.py      epochs of stretches, evaluation, checkpoints, a clean stop
    monitor.py     an epoch's end: the best epoch, early stopping, metrics.csv/TensorBoard, callbacks
    fit.py, summary.py     memtrain.fit (a job from Python) and its summary table
    placement.py   rounds in the server or on workers (train.workers, measured at start)
    scheduler.py   watches a stretch / runs tasks: deaths, hangs, failures, stop signals
    logbook.py     records up to the ledger -> lineage and metric lines, the position
    exchange.py    a pipe pair per worker slot; or InServer: the server as its own worker
    desk.py        async mode on workers: the desk made,      desk.py     tasks taken, gradients posted,
                   its groups' records logged                             groups stepped
    overlap.py     async mode streamed, replay, fixed staleness streamed: tasks out, the steps in the server
    stream.py      a cluster's round: the server steps,       stream.py   a streamed gradient task
                   the workers compute gradient tasks
    state.py, checkpoint.py, run_dir.py     resume, checkpoints, the run directory
                                            worker.py   messages in, answers out
    ------------------------- both (the server when train.workers = 0) -------------------------
    rounds.py      the round, one loop: step the previous update's slice, meet, compute this update's
                   gradients, meet; slot 0 publishes (fixed staleness: one meeting per update)
    marks.py       the board the participants meet at (marks, ledger, activities) and the records
    doorbell.py    sleeping on the board until a mark lands
    reduce.py      gradient buffers -> mean -> optimizer -> a slice of the next version
    plan.py        the fixed schedule: updates, tasks, who does which task and slice
    messages.py    the records that cross between processes
    weights.py     publishing, retiring and recycling weight versions
    maps.py, context.py, optim.py, normalize.py     maps kept between tasks, the model, the optimizer

docs/round.md walks through one round.
"""
