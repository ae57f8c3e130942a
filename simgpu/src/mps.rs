//! MPS control daemon fake (filled below).
