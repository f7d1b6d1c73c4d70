"""A Lightning loop for TrainingSweep (`lightning_loop.loop:train_loop`)."""
