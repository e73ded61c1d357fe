"""Built-in operators: stateless transforms (Spark SQL expressions) and keyed operators."""
