"""What the tests share: the sandbox fixture, fleets and deploy helpers, the real tools' wrappers,
the bad-input corpus, printed figures. Imported as `support.<module>` (tests/ is on sys.path: its
conftest.py)."""
