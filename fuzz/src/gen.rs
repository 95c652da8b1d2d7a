//! Values built from fuzzer bytes, for the encode → decode direction of the codecs: each read
//! takes what it needs and yields zeros once the bytes run out, so every input builds something.

pub struct Gen<'a> {
    bytes: &'a [u8],
}

impl<'a> Gen<'a> {
    pub fn new(bytes: &'a [u8]) -> Gen<'a> {
        Gen { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((b, rest)) => {
                self.bytes = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `max` items (the count from one byte).
    pub fn len(&mut self, max: usize) -> usize {
        usize::from(self.u8()) % (max + 1)
    }

    /// A string of up to `max` chars drawn from the input (any Unicode the bytes make).
    pub fn string(&mut self, max: usize) -> String {
        let n = self.len(max);
        let raw: Vec<u8> = (0..n).map(|_| self.u8()).collect();
        String::from_utf8_lossy(&raw).into_owned()
    }

    /// An `ip:port` the way pods are named (what config validation and discovery let through).
    pub fn addr(&mut self) -> String {
        let port = 1 + u32::from(self.u8()) * 200;
        format!("10.{}.{}.{}:{port}", self.u8(), self.u8(), self.u8())
    }

    /// A finite, non-negative number of the kind the boards carry, at the precision they write.
    pub fn number(&mut self, scale: f64) -> f64 {
        f64::from(self.u32()) / f64::from(u32::MAX) * scale
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}
