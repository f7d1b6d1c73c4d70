"""A Hugging Face Transformers Trainer loop for TrainingSweep (`hf_trainer_loop.loop:train_loop`)."""
