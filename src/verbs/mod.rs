//! The only code that touches verbs objects.
