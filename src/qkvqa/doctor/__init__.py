"""`qkvqa doctor`: checks a whole setup (paths, questions and images, KB, indexes, models, GPU, disk) before any GPU hour."""
