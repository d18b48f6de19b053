"""`memtrain bench train`: memtrain against one process, pickling through a Queue and shared memory."""
