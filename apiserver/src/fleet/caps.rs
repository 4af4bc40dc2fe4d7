//! What the fleet reflector keeps of one object at most, and the marker an object past a
//! cap carries instead of what it dropped. Below the objects (`crd`), their labels
//! (`labels`) and the reflector (`reflect`), which all read the caps; the view
//! (`resolve`) reads the marker.

use std::{collections::BTreeMap, fmt};

/// Longest value of a read `os.*` annotation that is kept. `elemental-register` sends short
/// os-release values (a `PRETTY_NAME` of a few dozen bytes; an image reference is at most a
/// 255-byte name, a 128-byte tag and a digest, and a mirror prefix), which the operator
/// HTML-escapes; 1 KiB leaves room for all of that.
pub const MAX_OS_VALUE_BYTES: usize = 1024;

/// Most labels of one object that are kept. The operator's inventory labels are the ones an
/// administrator's MachineRegistration names (a few to a few dozen; their values come from the
/// machine, at most 58 bytes each).
pub const MAX_LABELS: usize = 64;

/// Most bytes of one object's labels (keys and values together) that are kept: 64 labels of
/// 128 bytes. Kubernetes bounds one label (a 317-byte key, a 63-byte value), not their number.
pub const MAX_LABEL_BYTES: usize = 8 * 1024;

/// Most bytes of the spec fields of a ManagedOSImage that are kept (`osImage`,
/// `managedOSVersionName`, `nodeSelector`, `clusterTargets`, as JSON). Administrators write
/// these, a few hundred bytes each.
pub const MAX_IMAGE_SPEC_BYTES: usize = 64 * 1024;

/// Which cap a fleet object passed. Its labels and
/// annotations (a ManagedOSImage: its spec too) were dropped, so it is never
/// resolved from a partial copy: a machine is `Unknown`
/// (`MetadataTooLarge`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Oversize {
    /// A read `elemental.cattle.io/os.*` annotation's value is longer than
    /// [`MAX_OS_VALUE_BYTES`].
    OsValue {
        /// The annotation.
        key: &'static str,
        /// Its length.
        bytes: usize,
    },
    /// More labels than [`MAX_LABELS`].
    LabelCount {
        /// How many.
        count: usize,
    },
    /// Labels (keys and values) longer than
    /// [`MAX_LABEL_BYTES`] together.
    LabelBytes {
        /// Their length.
        bytes: usize,
    },
    /// A ManagedOSImage's spec fields read, serialized, are longer than
    /// [`MAX_IMAGE_SPEC_BYTES`].
    SpecBytes {
        /// Their length.
        bytes: usize,
    },
}

impl fmt::Display for Oversize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OsValue { key, bytes } => write!(
                f,
                "the annotation {key} is {bytes} bytes long, more than the {MAX_OS_VALUE_BYTES} this server keeps"
            ),
            Self::LabelCount { count } => write!(
                f,
                "it has {count} labels, more than the {MAX_LABELS} this server keeps"
            ),
            Self::LabelBytes { bytes } => write!(
                f,
                "its labels are {bytes} bytes long together, more than the {MAX_LABEL_BYTES} this server keeps"
            ),
            Self::SpecBytes { bytes } => write!(
                f,
                "its spec (osImage, managedOSVersionName, nodeSelector, clusterTargets) is {bytes} bytes long, more than the {MAX_IMAGE_SPEC_BYTES} this server keeps"
            ),
        }
    }
}

/// Which label cap `labels` pass, if any.
pub fn labels_oversize(labels: &BTreeMap<String, String>) -> Option<Oversize> {
    if labels.len() > MAX_LABELS {
        return Some(Oversize::LabelCount {
            count: labels.len(),
        });
    }
    let bytes = labels.iter().map(|(k, v)| k.len() + v.len()).sum();
    (bytes > MAX_LABEL_BYTES).then_some(Oversize::LabelBytes { bytes })
}
