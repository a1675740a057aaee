//! Bump allocation over a fixed capacity: the arena never grows, slices are
//! handed out by offset, and a phase ends by resetting the whole arena.

use core::fmt;

/// A byte range inside an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSlice {
    pub offset: u64,
    pub size: u64,
}

impl ArenaSlice {
    pub fn end(&self) -> u64 {
        self.offset + self.size
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaError {
    /// The request does not fit in what is left of the arena.
    OutOfSpace { requested: u64, aligned_offset: u64, capacity: u64 },
    /// Alignment must be a non-zero power of two.
    BadAlignment(u64),
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::OutOfSpace { requested, aligned_offset, capacity } => write!(
                f,
                "arena out of space: {requested} bytes requested at offset {aligned_offset}, capacity {capacity}"
            ),
            ArenaError::BadAlignment(a) => write!(f, "alignment {a} is not a power of two"),
        }
    }
}

/// An offset allocator over `capacity` bytes that remembers its high-water mark.
#[derive(Debug, Clone)]
pub struct BumpArena {
    capacity: u64,
    next: u64,
    high_water: u64,
}

impl BumpArena {
    pub fn new(capacity: u64) -> Self {
        Self { capacity, next: 0, high_water: 0 }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in use since the last reset.
    pub fn used(&self) -> u64 {
        self.next
    }

    /// The most bytes ever in use, across resets.
    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    pub fn alloc(&mut self, size: u64, align: u64) -> Result<ArenaSlice, ArenaError> {
        if align == 0 || !align.is_power_of_two() {
            return Err(ArenaError::BadAlignment(align));
        }
        let offset = self.next.div_ceil(align) * align;
        let end = offset.checked_add(size).filter(|&e| e <= self.capacity).ok_or(
            ArenaError::OutOfSpace { requested: size, aligned_offset: offset, capacity: self.capacity },
        )?;
        self.next = end;
        self.high_water = self.high_water.max(end);
        Ok(ArenaSlice { offset, size })
    }

    /// Frees every slice at once; the high-water mark is kept.
    pub fn reset(&mut self) {
        self.next = 0;
    }

    /// Frees the slices handed out since [`Self::used`] returned `mark`, so
    /// the next ones overlap them (scratch of steps that never run together).
    /// A mark beyond what is in use changes nothing.
    pub fn rewind(&mut self, mark: u64) {
        self.next = self.next.min(mark);
    }

    /// Moves the next offset to at least `end`, keeping `[.., end)` in use.
    pub fn reserve_to(&mut self, end: u64) -> Result<(), ArenaError> {
        if end > self.capacity {
            return Err(ArenaError::OutOfSpace { requested: end - self.next.min(end), aligned_offset: self.next, capacity: self.capacity });
        }
        self.next = self.next.max(end);
        self.high_water = self.high_water.max(self.next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_aligned_disjoint_and_bounded() {
        let mut a = BumpArena::new(1000);
        let s1 = a.alloc(10, 1).unwrap();
        let s2 = a.alloc(100, 256).unwrap();
        assert_eq!(s1, ArenaSlice { offset: 0, size: 10 });
        assert_eq!(s2, ArenaSlice { offset: 256, size: 100 });
        assert_eq!(a.used(), 356);
        let err = a.alloc(700, 4).unwrap_err();
        assert_eq!(err, ArenaError::OutOfSpace { requested: 700, aligned_offset: 356, capacity: 1000 });
        // A failed request leaves the arena as it was.
        assert_eq!(a.used(), 356);
        assert_eq!(a.alloc(644, 4).unwrap().end(), 1000);
    }

    #[test]
    fn reset_frees_everything_but_keeps_high_water() {
        let mut a = BumpArena::new(64);
        a.alloc(48, 16).unwrap();
        a.reset();
        assert_eq!(a.used(), 0);
        assert_eq!(a.alloc(64, 16).unwrap().offset, 0);
        assert_eq!(a.high_water(), 64);
    }

    #[test]
    fn rewound_slices_overlap_and_reserve_keeps_the_longer_run() {
        let mut a = BumpArena::new(1000);
        a.alloc(100, 1).unwrap();
        let mark = a.used();
        let first = a.alloc(300, 1).unwrap();
        let first_end = a.used();
        a.rewind(mark);
        let second = a.alloc(200, 1).unwrap();
        assert_eq!(second.offset, first.offset);
        a.reserve_to(first_end).unwrap();
        assert_eq!(a.used(), 400);
        assert_eq!(a.alloc(10, 1).unwrap().offset, 400);
        assert_eq!(a.high_water(), 410);
        assert!(a.reserve_to(1001).is_err());
        a.rewind(5000);
        assert_eq!(a.used(), 410);
    }

    #[test]
    fn rejects_bad_alignment_and_overflow() {
        let mut a = BumpArena::new(64);
        assert_eq!(a.alloc(1, 3), Err(ArenaError::BadAlignment(3)));
        assert_eq!(a.alloc(1, 0), Err(ArenaError::BadAlignment(0)));
        a.alloc(8, 1).unwrap();
        assert!(matches!(a.alloc(u64::MAX, 1), Err(ArenaError::OutOfSpace { .. })));
    }
}
