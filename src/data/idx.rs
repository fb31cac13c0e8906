//! MNIST's IDX format, the lowest layer of the data sets: a big-endian header (magic,
//! dimensions) and raw bytes, gzipped or not; and the errors data files can have.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Errors in data files: each says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DataError {
    #[error("{path}: not found. {hint}")]
    Missing { path: PathBuf, hint: String },
    #[error("{path}: not an IDX file (magic {found:#010x}, expected {expected:#010x}). Point --data-dir at MNIST-format files (train-images-idx3-ubyte[.gz], ...)")]
    BadMagic { path: PathBuf, found: u32, expected: u32 },
    #[error("{path}: truncated: header says {expected} bytes of data, the file holds {found}. Re-download or re-install the data set")]
    Truncated { path: PathBuf, expected: usize, found: usize },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// Reads an IDX file (gzipped when it starts with the gzip magic) and checks its
/// header against `expected_magic` (0x801 labels, 0x803 images) and its length.
/// Returns the dimensions and the raw bytes.
pub(crate) fn read_idx(path: &Path, expected_magic: u32) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::Invalid {
        path: path.into(),
        what: format!("cannot read: {e}"),
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(&raw[..])
            .take(1 << 34)
            .read_to_end(&mut out)
            .map_err(|e| DataError::Invalid {
                path: path.into(),
                what: format!("gzip data is corrupt or truncated ({e}). Re-download or re-install the data set"),
            })?;
        out
    } else {
        raw
    };
    if bytes.len() < 4 {
        return Err(DataError::Truncated {
            path: path.into(),
            expected: 4,
            found: bytes.len(),
        });
    }
    let magic = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    if magic != expected_magic {
        return Err(DataError::BadMagic {
            path: path.into(),
            found: magic,
            expected: expected_magic,
        });
    }
    let ndims = (magic & 0xff) as usize;
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(DataError::Truncated {
            path: path.into(),
            expected: header,
            found: bytes.len(),
        });
    }
    let dims: Vec<usize> = (0..ndims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let found = bytes.len() - header;
    let Some(expected) = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) else {
        return Err(DataError::Invalid {
            path: path.into(),
            what: format!("header dimensions {dims:?} describe more bytes than any file holds: the header is damaged"),
        });
    };
    if found < expected {
        return Err(DataError::Truncated {
            path: path.into(),
            expected,
            found,
        });
    }
    Ok((dims, bytes[header..header + expected].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn write_idx(path: &Path, magic: u32, dims: &[u32], data: &[u8], gzip: bool) {
        let mut bytes = magic.to_be_bytes().to_vec();
        for d in dims {
            bytes.extend_from_slice(&d.to_be_bytes());
        }
        bytes.extend_from_slice(data);
        if gzip {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            bytes = enc.finish().unwrap();
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn idx_reader_accepts_raw_and_gzip_and_names_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8], false);
        assert_eq!(read_idx(&p, 0x803).unwrap(), (vec![2, 2, 2], vec![1, 2, 3, 4, 5, 6, 7, 8]));
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8], true);
        assert_eq!(read_idx(&p, 0x803).unwrap().1.len(), 8);
        let e = read_idx(&p, 0x801).unwrap_err().to_string();
        assert!(e.contains("not an IDX file") && e.contains("0x00000803"), "{e}");
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3], false);
        let e = read_idx(&p, 0x803).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("8 bytes") && e.contains("holds 3"), "{e}");
    }
}
