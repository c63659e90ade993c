"""User rewards for tests/rewards/test_deadline.py, imported by dotted name (`_user_rewards:NAME`)."""

import os
import time


def length_reward(response, problem):
    return float(len(response))


def hangs_on_x(response, problem):
    if "x" in response:
        while True:  # never returns
            time.sleep(60)
    return 1.0


def raises(response, problem):
    raise ValueError("bad input")


def dies(response, problem):
    os._exit(9)


def says_yes(response, problem):
    return "yes"


def always_none(response, problem):
    return None


def forks_on_fork(response, problem):
    """On "fork": forks a helper that returns (the mistake: it should end with os._exit) and waits for it."""
    if "fork" in response:
        pid = os.fork()
        if pid == 0:
            return -1.0
        os.waitpid(pid, 0)
    return float(len(response))


def reply_channel() -> int:
    """The worker's reply channel as the reward sees it: the one pipe this process holds open for writing."""
    import fcntl
    import stat

    for fd in range(3, 256):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                return fd
        except OSError:
            continue
    raise RuntimeError("no reply channel found")


def writes_on_bogus(response, problem):
    """On "bogus": writes a reply-like line on the worker's reply channel, then returns as usual."""
    if "bogus" in response:
        os.write(reply_channel(), b'{"value": 42}\n')
    return float(len(response))


def raises_the_key(response, problem):
    raise ValueError(f"bad credentials {os.environ['REGROUP_SECRET_TEST_KEY']} for the grader")
