"""What follows the model's hidden states on the device: pooling a vector per sequence (or per
late-chunking span), a sentence-transformers folder's Dense modules, and a scoring model's score
head."""
