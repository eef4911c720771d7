"""The golden set (questions from rated answers) and its evaluation runs: retrieval and answers."""
