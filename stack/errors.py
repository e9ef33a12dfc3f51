"""User-facing failures of set-up and start-up: one message naming the problem and the fix."""


class StackError(Exception):
    """A problem the user can fix; the CLI prints it without a stack trace."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.problem = problem
        self.fix = fix
