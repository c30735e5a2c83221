"""The synthetic KB-VQA world of the tests and `make demo` (`qkvqa synth`): generator (`world`) and procedural images (`render`)."""
