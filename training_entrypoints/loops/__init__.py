"""Built-in train loops (`trainLoop: training_entrypoints.loops.<module>:train_loop`)."""
