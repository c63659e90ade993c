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
