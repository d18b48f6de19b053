"""Training: a job -> versioned weight files, through rounds that worker processes (or the server) run.

The folders say which process runs what (each folder's __init__.py says what it owns):

    server/      the server process only
      command.py   the `memtrain train` CLI;  fit.py, summary.py: memtrain.fit and its summary table
      server.py    the epoch loop (Trainer.fit, naming no mode): the engine made once, evaluation, checkpoints,
                   a clean stop
      choice.py    the run's engine, chosen once from one table (ENGINES): its placement, its maker
      engines.py   who steps, one interface (run the rest of an epoch): Rounds, ClusterRounds, Desk, ServerSteps
                   (the server steps the whole vector: loops/overlap.py); each handed an EngineContext
      replay.py, onepass.py   two more engines: Replay (a lineage run again: ServerSteps with Recorded), OnePass
                   (an additive model's statistics and solve)
      placement.py rounds in the server or on workers (train.workers, measured at start)
      exchange.py  WorkerPool: worker/pool.py's, running worker_main; or InServer: the server as its own worker
      scheduler.py watches a stretch / runs tasks: deaths, hangs, failures, stop signals
      pools.py     a cluster's Dask workers as a transport
      outline.py   the model built once in a short child when workers compute every gradient: the server
                   holds its layout and version 0, never the framework (torch)
      monitor.py   an epoch's end: the best epoch, early stopping, metrics.csv/TensorBoard, callbacks
      room.py, datacheck.py, advice.py   the start-up checks: disk room, the data, advice
    worker/      a worker process only (one per slot; spawned); reaches nothing of server/
      worker.py    messages in, answers out;  launch.py: the process made quiet, BLAS on one thread
      pool.py      the pool of worker processes (a pipe pair per slot), started by the server or by a node
    loops/       the loops an update runs through: in workers, and in the server when train.workers = 0
      rounds.py    the round, one loop: step the previous update's slice, meet, compute this update's
                   gradients, meet; slot 0 publishes (fixed staleness: one meeting per update)
      desk.py      async mode on workers: the server's DeskFile and group records; a worker's tasks taken,
                   gradients posted, groups stepped
      overlap.py   the server's one loop of whole-vector steps (fixed staleness streamed, async in the
                   server, replay): tasks out as the schedule's agenda says (server only)
      sliced.py, stream.py   a cluster's round (SlicedParticipant): streamed gradient tasks, then one step
                   task per slice written with pwrite, published (cluster/broadcast.py keeps its records);
                   stream.py's ServerGradients: the server computing its own streamed gradients (no
                   worker: no transport, scheduler or message between overlap.py's loop and a gradient)
      additive.py  an additive model's pass: statistics tasks in chunks into mapped partials, summed in
                   task order (the server's side and the worker's)
      mapped.py    what every engine shares: the run's files mapped (RoundFiles), a task's rows (TaskRows),
                   RoundFiles.step_and_publish: the one whole-vector step (desk, overlap)
      gradient.py  a task's loss and gradient: seeds, fault point, timing, straggler hook, read audit
      reduce.py    gradient buffers -> mean -> optimizer -> a slice of the next version
      maps.py, threads.py   maps kept between tasks; the server's task threads
      node_round.py, node_sum.py, node_compute.py   the two-level cluster round (docs/cluster.md): the server's
                   NodeParticipant, the partial sums a node continues the in-order fold through, a node's
                   compute of its task range
    exchange/    the exchange area's shared files (/dev/shm), read and written by both processes
      area.py      the one owner of the exchange's files: each kind's name, lifetime (run, stretch, update,
                   attempt) and remover; every file made gets its path there, every removal goes through it
      marks.py     the board the participants meet at (marks, ledger, activities) and the round records
      doorbell.py  sleeping on the board until a mark lands
      weights.py   publishing, retiring and recycling weight versions; the one keep rule
    records/     the run directory's records, which outlive the run (written by the server)
      run_dir.py, record.py   the run directory, job.json and history.jsonl
      logbook.py   records up to the ledger -> each update's lineage and metric lines, the position; the
                   server's chores (Chores: when the lines are written, the progress line shown)
      lineage.py, metrics.py, counters.py   lineage.jsonl (its first line, reading it back), metrics and task
                   statistics, the counters shown
      checkpoint.py, state.py   checkpoints, and where a run stands: fresh starts and resumes
    shared, at the top (both processes)
      plan.py      the job's updates and tasks, each task's rows (Plan.rows: train.shuffle's order),
                   who does which task and slice
      schedule.py  which gradients each update adds, at which version: Planned(k), Arrival, Recorded;
                   one agenda(position, updates) each (server/choice.py ENGINES: a table), pure
      messages.py  the records that cross between processes
      context.py, normalize.py, optim.py   the model and its normalizer, the optimizer
      memory.py    the memory limits (the server's words for a killed worker; a worker's test limit)
      timing.py    the one timing hook: named sections a measurement's timer times (benchmarks/), untimed
                   by default at no cost (the parts call what they called before)

docs/round.md walks through one round; docs/how-it-works.md follows one update through these modules.

Glossary (one name per concept, everywhere in this package):

    version      a published weight file, weights/vNNNNNNNN.npy; an applied update makes version + 1
    update       one optimizer step: its number in the whole run (epoch * updates per epoch + batch);
                 in async mode an update is a group of gradients
    batch        an update's number within its epoch
    task         a piece of rows whose gradient one process computes: its number within its update (the
                 reduction adds in this order); in async mode its number in the epoch's task stream. Its
                 rows: positions [lo, hi) of the epoch's row sequence, which Plan.rows turns into rows
    attempt      how many times a task was started before (a retry after a death: a new file name)
    ticket       what a streamed gradient task is handed out under (messages.GradTask.ticket), naming its file:
                 the plan's update number (fixed staleness, a cluster's rounds), async's own count of
                 hand-outs, or a replay's step index; never called its update, which it is only in the first
    partial      an additive model's statistics of one task's rows, a float64 file the model adds into
    chunk        train.chunk_rows rows of a statistics task, read and added at once (loops/additive.py)
    schedule     what is computed: which gradients each update adds, at which version (schedule.py); what
                 it keeps across updates is its own state (PlannedState, ArrivalState), which the position
                 carries without asking its kind and a checkpoint stores under the schedule's name
    agenda       a schedule's state over one epoch (a replay: the whole lineage): what can start, which
                 arrived gradients form the next update (schedule.Agenda)
    engine       who steps, on the server's side (server/engines.py): Rounds (slices, marks), ClusterRounds (the
                 server's stretch on a cluster), Desk (groups), ServerSteps (the whole vector, streamed), Replay,
                 OnePass (an additive model's solve); each is handed an EngineContext, what it uses of the server,
                 and made as its row of server/choice.ENGINES says
    loop         what a worker runs a stretch with (messages.Loop): the rounds' or the desk's
    desk         async mode's meeting place on worker processes: the engine engines.Desk, its file and lock
                 desk.DeskFile
    board        the round's marks, ledger and activities (marks.Board); a cluster's broadcast round keeps
                 its records in a scheduler plugin, cluster/broadcast.BroadcastPlugin
    stretch      a run of updates handed to every participant at once (messages.Stretch)
    chores       the server's own work between two updates: lines logged, progress shown, a stop or the
                 placement's end of a stretch looked at (records/logbook.Chores, in_stretch); on a
                 cluster also its file chores while the workers compute (loops/sliced.py)
    slot         a participant's number in a stretch (a worker process, or the server itself)
    state vector one of the optimizer's per-parameter vectors (m, v: optim.state_names), double-buffered
                 in the exchange (opt-<state>-<parity>.npy); a checkpoint's record lists them as "slots"
    generation   a stretch's number: the marks of an older stretch never count for a newer one
    mark         a word a participant writes on the board when its part of a meeting is done (exchange/marks.py)
    ledger       the last update finished and the version after it: where the next stretch starts
    record       how an update (rounds) or a group (desk) ended, in the exchange area, status written last
    lineage      lineage.jsonl: per version, the rows and the version each gradient was computed at
    staleness    how many versions older than its update's parent a gradient was computed at
    keep rule    weights.versions_to_keep: the newest run.keep_versions, and every version still read
    outcome      how a piece of work ended (messages.Outcome), a task's, a participant's or a stretch's
"""
