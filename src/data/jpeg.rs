//! JPEG decoding with libjpeg-turbo, through the C shim `jpeg_shim.c`: the header, and a
//! region of the image, optionally scaled by 1/2, 1/4 or 1/8 in the DCT domain. Only the
//! iMCU columns holding the region are decoded and the rows above it are skipped, so a
//! random crop costs less than the whole image.

use std::os::raw::{c_char, c_int, c_ulong};

extern "C" {
    fn ddp_jpeg_header(
        data: *const u8,
        len: c_ulong,
        width: *mut c_int,
        height: *mut c_int,
        components: *mut c_int,
        msg: *mut c_char,
        msg_len: usize,
    ) -> c_int;
    fn ddp_jpeg_decode_region(
        data: *const u8,
        len: c_ulong,
        scale_denom: c_int,
        x: c_int,
        y: c_int,
        w: c_int,
        h: c_int,
        out: *mut u8,
        msg: *mut c_char,
        msg_len: usize,
    ) -> c_int;
    #[cfg(test)]
    fn ddp_jpeg_encode(
        pixels: *const u8,
        width: c_int,
        height: c_int,
        components: c_int,
        quality: c_int,
        progressive: c_int,
        out: *mut *mut u8,
        out_len: *mut c_ulong,
        msg: *mut c_char,
        msg_len: usize,
    ) -> c_int;
    #[cfg(test)]
    fn ddp_jpeg_free(buffer: *mut u8);
}

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub width: usize,
    pub height: usize,
    /// 1 (grayscale), 3 (YCbCr or RGB) or 4 (CMYK, YCCK).
    pub components: usize,
}

/// Why a file did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JpegError {
    #[error("truncated JPEG ({0})")]
    Truncated(String),
    #[error("invalid JPEG ({0})")]
    Invalid(String),
}

/// True when `bytes` start with a JPEG's start-of-image marker.
pub(crate) fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

fn message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The image's size and components.
pub(crate) fn header(bytes: &[u8]) -> Result<Header, JpegError> {
    let (mut w, mut h, mut c) = (0, 0, 0);
    let mut msg = [0u8; 256];
    // SAFETY: the shim reads `bytes` within its length and writes at most msg.len() bytes.
    let rc = unsafe {
        ddp_jpeg_header(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            &mut w,
            &mut h,
            &mut c,
            msg.as_mut_ptr().cast(),
            msg.len(),
        )
    };
    if rc != 0 {
        return Err(JpegError::Invalid(message(&msg)));
    }
    Ok(Header {
        width: w as usize,
        height: h as usize,
        components: c as usize,
    })
}

/// The size of one side of the image decoded at 1/`denom` (libjpeg rounds up).
pub(crate) fn scaled_len(len: usize, denom: usize) -> usize {
    len.div_ceil(denom)
}

/// A region `w`×`h` at (`x`, `y`) of the image scaled by 1/`denom` (1, 2, 4 or 8), as
/// packed RGB rows. Grayscale and CMYK come out as RGB.
pub(crate) fn decode_region(bytes: &[u8], denom: usize, x: usize, y: usize, w: usize, h: usize) -> Result<Vec<u8>, JpegError> {
    assert!(matches!(denom, 1 | 2 | 4 | 8), "scale 1/{denom} is not one libjpeg offers");
    let mut out = vec![0u8; w * h * 3];
    let mut msg = [0u8; 256];
    // SAFETY: `out` holds the w×h×3 bytes the shim writes (it checks the region against
    // the image first); `bytes` is read within its length.
    let rc = unsafe {
        ddp_jpeg_decode_region(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            denom as c_int,
            x as c_int,
            y as c_int,
            w as c_int,
            h as c_int,
            out.as_mut_ptr(),
            msg.as_mut_ptr().cast(),
            msg.len(),
        )
    };
    match rc {
        0 => Ok(out),
        2 => Err(JpegError::Truncated(message(&msg))),
        _ => Err(JpegError::Invalid(message(&msg))),
    }
}

/// Encodes packed pixels (`components` 1: gray, 3: RGB, 4: CMYK, written with an Adobe
/// marker) of a `width`×`height` image as a baseline JPEG of `quality` (1–100).
#[cfg(test)]
pub(crate) fn encode(pixels: &[u8], width: usize, height: usize, components: usize, quality: u8) -> Result<Vec<u8>, JpegError> {
    encode_as(pixels, width, height, components, quality, false)
}

/// As [`encode`], progressive when `progressive` (libjpeg's default scan script).
#[cfg(test)]
pub(crate) fn encode_as(
    pixels: &[u8],
    width: usize,
    height: usize,
    components: usize,
    quality: u8,
    progressive: bool,
) -> Result<Vec<u8>, JpegError> {
    assert!(
        matches!(components, 1 | 3 | 4),
        "{components} components: JPEG files here hold 1, 3 or 4"
    );
    assert_eq!(
        pixels.len(),
        width * height * components,
        "pixels hold width × height × components bytes"
    );
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len: c_ulong = 0;
    let mut msg = [0u8; 256];
    // SAFETY: the shim reads width × height × components bytes of `pixels` (asserted
    // above) and hands back a buffer of `len` bytes that ddp_jpeg_free releases.
    unsafe {
        let rc = ddp_jpeg_encode(
            pixels.as_ptr(),
            width as c_int,
            height as c_int,
            components as c_int,
            quality.clamp(1, 100) as c_int,
            progressive as c_int,
            &mut out,
            &mut len,
            msg.as_mut_ptr().cast(),
            msg.len(),
        );
        let bytes = if out.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(out, len as usize).to_vec()
        };
        ddp_jpeg_free(out);
        if rc != 0 {
            return Err(JpegError::Invalid(message(&msg)));
        }
        Ok(bytes)
    }
}
