"""The workers' Celery app, with unacknowledged tasks given back to the queue within seconds instead of an hour.

A task is acknowledged when it has finished (task_acks_late), so one whose worker was killed stays unacknowledged in
Redis; kombu's Redis transport puts it back in its queue once it is older than the visibility timeout (an hour by
default), checking every unacked_restore_interval × unacked_restore_throttle seconds and when a worker starts. The
tests of a killed worker wait seconds, not an hour. The timeout must stay longer than any task of the test takes, or
a task still running would be delivered a second time.
"""
from workers.celery_app import app

VISIBILITY_TIMEOUT_S = 10

app.conf.broker_transport_options = {"visibility_timeout": VISIBILITY_TIMEOUT_S, "unacked_restore_interval": 1,
                                     "unacked_restore_throttle": 1}
