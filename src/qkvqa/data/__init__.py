"""The data layer: KB store, section strings, question readers, image resolvers, published protocols."""
