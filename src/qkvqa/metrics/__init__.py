"""Official InfoSeek / E-VQA scorers, the BEM judge, retrieval and analysis metrics, DDP-safe torchmetrics."""
