"""Real text: Wikipedia and SQuAD with real MiniLM weights (driver: ``main.py``)."""
