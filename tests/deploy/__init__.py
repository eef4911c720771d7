"""Tests of the production deployment (deploy/): two web processes and a worker behind nginx."""
