"""Device profiles: measured throughput of each device, for the launcher and the tuner."""

from omnikeras.profiles.profile import ClusterProfile, DeviceProfile, batch_shares

__all__ = ["ClusterProfile", "DeviceProfile", "batch_shares"]
