"""tests/aws-local: the deployed shape (template.yaml) run whole on one machine, without Docker.

`python -m aws_local.main` (through the `tests/aws-local` entry) starts DynamoDB Local, moto's
SQS, the functions' real binaries under a Lambda Runtime API emulator, an IAM-enforcing proxy
per function, an API Gateway HTTP API front door and an admin endpoint. docs/OPERATIONS.md.
"""
