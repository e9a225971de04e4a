"""Stand-in for the FUTEBOL agent's ``lib/channel.py`` (written for oddl's tests, not copied).

``finisar_serial_adapter`` imports ``Channel`` only to read ``Channel.IMMUTABLE_PROPERTIES``
when it decides whether the grid must be rebuilt; the original class (a full WDM channel
model needing ``six``) is not needed to drive the WSS, so only that attribute is provided,
with the value the original declares.
"""


class Channel:
    IMMUTABLE_PROPERTIES = ("central_frequency", "bandwidth")
