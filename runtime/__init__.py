"""The job manager: Spark session, epoch loop, metrics display, and the tests-block runner."""
