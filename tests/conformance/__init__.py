"""The conformance kit's targets: the project's services under the conformance profile, and
deliberately broken variants of each (test-only subclasses, run as `python -m tests.conformance.broken_*`)."""
