"""Calibration: measure kernels and collectives with PyTorch, fit a device profile.

    sim5d calibrate run --device cpu --out cpu.csv        # sim.calibrate.runner (needs torch)
    sim5d calibrate fit cpu.csv --out cpu.yaml            # sim.calibrate.fit (numpy only)
    sim5d calibrate steps runs.yaml --gpu h100-sxm-80gb --out h100.yaml
                                # sim.calibrate.step_fit: constants fitted to measured steps

The CSV format is sim.calibrate.csvio's; what is measured and how it is counted is
sim.calibrate.shapes'; the fitted terms are the `extra.compute` keys of sim.compute and the
link class of a topology (sim.topology.schema).
"""
