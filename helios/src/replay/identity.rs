//! Whether the device can run what the core was prepared on.

use super::error::ReplayError;
use crate::core::proto::Identity;
use crate::cuda::DeviceInfo;

/// Checks the device against the core's identity: the compute capability
/// must be the one recorded (kernel images are built for it), unless the
/// core leaves it unrecorded (0).
pub fn check_device(identity: &Identity, device: &DeviceInfo) -> Result<(), ReplayError> {
    let expected = (
        identity.compute_capability_major,
        identity.compute_capability_minor,
    );
    let found = (
        device.compute_capability_major,
        device.compute_capability_minor,
    );
    if expected.0 != 0 && expected != found {
        return Err(ReplayError::DeviceMismatch {
            expected,
            found,
            ordinal: device.ordinal,
            name: device.name.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".to_owned(),
            compute_capability_major: 9,
            compute_capability_minor: 0,
            sm_count: 132,
            driver_version: 13000,
            total_memory: 150 << 30,
        }
    }

    fn prepared_on(major: u32, minor: u32) -> Identity {
        Identity {
            compute_capability_major: major,
            compute_capability_minor: minor,
            ..Identity::default()
        }
    }

    #[test]
    fn the_same_compute_capability_runs() {
        assert!(check_device(&prepared_on(9, 0), &h200()).is_ok());
    }

    #[test]
    fn an_unrecorded_compute_capability_runs() {
        assert!(check_device(&prepared_on(0, 0), &h200()).is_ok());
    }

    #[test]
    fn another_compute_capability_is_refused() {
        for (major, minor) in [(8, 0), (9, 1), (10, 0)] {
            let err = check_device(&prepared_on(major, minor), &h200()).unwrap_err();
            assert!(matches!(
                err,
                ReplayError::DeviceMismatch { expected, found: (9, 0), .. } if expected == (major, minor)
            ));
        }
    }
}
