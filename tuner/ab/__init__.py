"""The A/B gate and its statistics: the boot order, the per-boot sample, the tests, the sequential boundaries, the
night's false-keep control, noise dimensioning and the gate's policy."""
